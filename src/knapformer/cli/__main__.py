from knapformer.cli import app

app(prog_name="knapformer")

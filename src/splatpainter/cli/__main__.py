from splatpainter.cli import app

app(prog_name="splatpainter")

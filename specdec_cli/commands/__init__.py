"""One module per subcommand; `specdec_cli.cli` registers them on the typer app."""

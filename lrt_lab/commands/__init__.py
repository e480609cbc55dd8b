"""The command line (`lrt-lab`, `commands.cli`) and what only it runs: the demo, the bench, the
analysis subcommands and the dashboard's launcher; the top layer, which nothing in lrt_lab
imports."""

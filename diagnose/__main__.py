from diagnose.cli.commands import main

main()

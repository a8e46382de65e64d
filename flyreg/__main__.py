from flyreg._cli.main import main

main()

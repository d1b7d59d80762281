from scripts.studies.horizon.run import main

main()

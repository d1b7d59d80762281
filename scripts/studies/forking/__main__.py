from scripts.studies.forking.run import main

main()

from scripts.studies.sod.run import main

main()

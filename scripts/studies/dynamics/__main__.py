from scripts.studies.dynamics.run import main

main()

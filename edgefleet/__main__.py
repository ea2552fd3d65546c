from edgefleet.cli import main

main()

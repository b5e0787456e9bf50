from artifactstore.cli import main

main()

from loopfence.cli import main

main()

from vcam.cli import main

main()

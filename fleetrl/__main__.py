from fleetrl.cli import main

raise SystemExit(main())

from dlprof_profiler.cli.main import main

raise SystemExit(main())

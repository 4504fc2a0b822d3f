from dlprof_profiler.cli import main

raise SystemExit(main())

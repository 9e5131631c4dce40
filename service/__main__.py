from service.cli import main

# Guarded: a spawned child process (the refit process) imports this module as __mp_main__.
if __name__ == "__main__":
    raise SystemExit(main())

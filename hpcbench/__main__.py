from hpcbench.cli import main

if __name__ == "__main__":  # not when multiprocessing's spawn imports this module in a child
    raise SystemExit(main())

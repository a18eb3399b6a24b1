"""The checkers, one module per chapter. Each build checker is ``check_...(t: Tester)``, each predict
checker ``measure_...() -> Measurement``; ``catalog.py`` names them."""

"""Benchmarks (not tests): each module's ``run()`` returns rows; ``python -m bench`` prints them."""

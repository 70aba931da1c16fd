"""Peers the project is measured against, written the way their own users would write them.

Nothing here is the project's code: each peer is a stand-alone program run by a
benchmark scenario (``python -m benchmarks --scenario peer``).  They need the
``bench`` extra (``pip install -e '.[bench]'``).
"""

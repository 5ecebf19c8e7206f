"""How a stripe's bytes are coded: erasure.py (EC and replication policies over pyeclib's
liberasurecode), compression.py (a band's codec). Kept apart from datapath/, whose package imports
its whole pipeline."""

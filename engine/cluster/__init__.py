"""A cluster of hosts: what they agree on through etcd (docs/cluster.md)."""

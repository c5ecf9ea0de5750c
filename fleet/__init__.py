"""fleet: run workloads across EC2 instance types and rank them by cost per unit of work."""

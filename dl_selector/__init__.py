"""Instance selector: which accelerated EC2 instance for a workload, at what cost, and why."""

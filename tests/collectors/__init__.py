"""The rank side: what the collectors record, and that recording never changes the job."""

"""Backend signals: parsing engine ``/metrics`` (pure), pool snapshots, and the scraper."""

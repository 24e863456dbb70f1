"""acme_tabular: an example of a team's own Fedge plugin package (a model factory and a data source)."""

"""The reproduction harness: a grid of ordinary ``coordinator start`` runs, resumable and tabulated (``grid``), and
where their cells run, one at a time, several at once or as Ray tasks (``runner``)."""

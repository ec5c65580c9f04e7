"""Living with the audit over a long training run: baselines, tolerated rates, diffs between
runs, filtered copies of a log, and a watcher that audits each step as a trainer writes it."""

"""`meshalloc bench`: the paper's experiments, each writing results/<name>/, summarised in
results/SUMMARY.md. See framework.py for what an experiment is and docs/bench.md."""

# Command-line name -> module in this package, in the order `meshalloc bench` runs them.
EXPERIMENT_MODULES = {
    "redis-lru": "redis_lru",
    "ruby-strings": "ruby_strings",
    "thread-scaling": "thread_scaling",
    "speed": "speed",
    "real-apps": "real_apps",
    "large-heap": "large_heap",
    "traces": "traces",
    "handles": "handles",
}

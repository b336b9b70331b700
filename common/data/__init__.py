"""The data layer every workload shares: layouts, specs, the epoch sampler, the prefetching loader
(torch or DALI), sizes over nodes, and the synthetic-data driver. See docs/adding-a-workload.md."""

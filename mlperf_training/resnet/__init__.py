"""MLPerf Training ResNet-50 v1.5, workload ``resnet`` of the training suite (ruleset training 4.0.0).
See docs/resnet.md."""

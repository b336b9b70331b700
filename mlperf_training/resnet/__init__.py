"""MLPerf Training ResNet-50 v1.5, registered as workload ``resnet`` of the training suite (ruleset
training 4.0.0): the ImageNet folder layout, a synthetic image generator, Pillow and DALI loaders with
the reference augmentation and a decoded-image cache, and the workload on the shared harness. See
docs/resnet.md.
"""

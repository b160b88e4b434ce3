"""Making drafters: the target's answers and features (distill), the training loop, and the
train-draft job that ties them together."""

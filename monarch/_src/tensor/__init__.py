"""The tensor engine: distributed torch tensors computed by a single controller on a proc mesh."""

"""Flower strategies that run GradPerturb at the label party."""

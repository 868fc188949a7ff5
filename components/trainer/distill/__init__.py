"""Knowledge distillation: a small student learns a frozen teacher's (or ensemble's) softened outputs."""

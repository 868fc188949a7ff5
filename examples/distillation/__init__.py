"""Knowledge distillation on scikit-learn's 8x8 digits: teachers, soft targets, a student, an evaluation."""

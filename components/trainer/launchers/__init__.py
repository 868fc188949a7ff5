"""Launchers start the Trainer's processes: locally on loopback, as a Kubeflow TFJob, or on Vertex AI."""

"""AdaPonder: adaptive-depth recurrent (pondering) language models on Pythia backbones."""

__version__ = "0.1.0"

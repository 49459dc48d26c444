"""distillery: turn a pretrained BERT-family encoder into a smaller, faster student, measured."""

__version__ = "0.1.0"

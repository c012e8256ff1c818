"""Data: the CS224N task files and text corpora (``tasks``), SentEval's evaluation files
(``senteval``) and the downloader (``download``; ``python -m bertcf.data download``)."""

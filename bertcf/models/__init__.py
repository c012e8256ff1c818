"""The models: the sentence encoder (``encoder``), the Glow flow (``flow``) and its
sentence-transformers module (``st_flow``), the sentence-transformers layout of a checkpoint
(``st_format``), and the multitask model (``multitask``)."""

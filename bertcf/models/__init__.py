"""The models: the sentence encoder (``encoder``), the Glow flow (``flow``) and its
sentence-transformers module (``st_flow``), and the multitask model (``multitask``)."""

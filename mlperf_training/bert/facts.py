"""Published facts of the MLPerf BERT-large benchmark that the code here relies on.

Sources: the MLPerf Training reference (``language_model/tensorflow/bert``: ``create_pretraining_data.py``
flags and its README) and NVIDIA's submissions (``training_results_v*/NVIDIA/benchmarks/bert``: the HDF5
converters, the packed-data tools and ``run_pretraining.py``).
"""
from __future__ import annotations

#: ``--max_seq_length`` and ``--max_predictions_per_seq`` of the reference's data generation
MAX_SEQ_LEN = 512
MAX_PRED = 76
#: the fraction of tokens chosen for prediction (``--masked_lm_prob``)
MASKED_LM_PROB = 0.15
#: WordPiece vocabulary of bert-large-uncased (``vocab.txt``, ``bert_config.json``)
VOCAB_SIZE = 30522
#: special token ids of that vocabulary
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 100, 101, 102, 103
#: NVIDIA pads the embedding/decoder vocabulary to a multiple of 8 (30522 -> 30528) for tensor cores
VOCAB_PAD_MULTIPLE = 8
#: NVIDIA's packed dataset: at most 3 sequences per row (``--max_seq_per_sample 3``); the packing
#: strategy of the reference data halves the rows (156,726,829 sequences -> 78,404,631 rows,
#: expected speed-up 1.999; the unpacked data holds 4.04e10 padding tokens, i.e. a mean length of
#: about 254 of 512 tokens)
MAX_SEQ_PER_ROW = 3
REFERENCE_SEQUENCES = 156_726_829
REFERENCE_PACKED_ROWS = 78_404_631
#: evaluation: 10,000 samples of the held-out set; target masked-LM accuracy (closed division)
EVAL_SAMPLES = 10_000
TARGET_MLM_ACCURACY = 0.720


def padded_vocab(vocab_size: int, multiple: int = VOCAB_PAD_MULTIPLE) -> int:
    """The vocabulary the embedding and decoder are built with (NVIDIA: rounded up to ``multiple``)."""
    return -(-vocab_size // multiple) * multiple

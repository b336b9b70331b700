"""Facts of the MLPerf unet3d benchmark (KiTS19 as the reference preprocesses it), in one place."""
from __future__ import annotations

#: case ids of the validation split, as the reference's ``evaluation_cases.txt`` lists them (42 of 210)
EVAL_CASES: tuple[int, ...] = (
    0, 3, 5, 6, 12, 24, 34, 41, 44, 49, 52, 56, 61, 65, 66, 70, 76, 78, 80, 84, 86,
    87, 92, 111, 112, 125, 128, 138, 157, 160, 161, 162, 169, 171, 176, 185, 187, 189, 198, 203, 206, 207,
)
NUM_CASES = 210  # cases 00000 .. 00209 (the reference's MAX_ID)
TRAIN_SAMPLES = NUM_CASES - len(EVAL_CASES)  # 168, what closed_unet3d.yaml requires
CLASSES = ("background", "kidney", "tumour")  # label values 0, 1, 2
MIN_SHAPE = (128, 128, 128)  # the reference pads every case to at least this (edge mode)
# intensity normalisation of the reference's preprocessing: clip HU to [-79, 304], then (HU - 101) / 76.9
HU_CLIP = (-79.0, 304.0)
HU_MEAN, HU_STD = 101.0, 76.9

"""Which layers of PP-OCRv4's text detector must stay in float32 for its text mask (probability
> 0.3, as PaddleOCR thresholds it) to keep IoU >= 0.98 with the FP32 mask on every image?
Usage: python ocr_det_mask_iou.py ch_PP-OCRv4_det_infer.onnx [IMAGE_DIR] (the model ships in
rapidocr-onnxruntime==1.4.4; without IMAGE_DIR, 16 synthetic 96x96 text lines)."""
import sys
from pathlib import Path

import numpy as np
import mixprec


def images(directory=None, n=16, size=96):
    if directory:  # your own pages: any image PIL reads, resized to size x size
        from PIL import Image
        paths = sorted(Path(directory).iterdir())[:n]
        pages = [np.asarray(Image.open(p).convert("RGB").resize((size, size)), np.float32) for p in paths]
    else:  # dark strokes on a light page
        rng = np.random.default_rng(0)
        pages = [np.full((size, size, 3), 235.0, np.float32) for _ in range(n)]
        for page in pages:
            for x in range(5, size - 8, 7):
                y = int(rng.integers(30, 55))
                page[y : y + int(rng.integers(6, 14)), x : x + int(rng.integers(2, 6))] = 20.0
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    return [{"x": ((p / 255 - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)} for p in pages]


def mask_iou_at_least_099(outputs, golden):
    for out, ref in zip(outputs, golden):
        a, b = out["sigmoid_0.tmp_0"] > 0.3, ref["sigmoid_0.tmp_0"] > 0.3
        if (a & b).sum() < 0.98 * (a | b).sum():  # two empty masks agree
            return False
    return True


result = mixprec.debug_precision(sys.argv[1], precision="float16", inputs=images(*sys.argv[2:3]),
                                 criterion=mask_iou_at_least_099, mode="minimal")
print(f"{result.outcome}: {len(result.layers)} layer(s) stay in float32 ({result.evaluations} evaluations):")
print("  " + ", ".join(result.layers))
result.export("ppocr_det_mixed.onnx")  # TensorRT 11: trtexec --onnx=ppocr_det_mixed.onnx --stronglyTyped

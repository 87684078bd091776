#!/usr/bin/env python3
"""Writes scikit-learn's bundled digits (1,797 8x8 grey images, no download)
as the .npy files examples/resnet reads:

    python3 tools/make_digits.py OUT_DIR
    build/ci/examples/accrue_resnet --data OUT_DIR

OUT_DIR/digits_images.npy: f32 [1797, 1, 8, 8], pixels 0..16 scaled to 0..1.
OUT_DIR/digits_labels.npy: i64 [1797], the digit.
The order is scikit-learn's (the example holds out the last 300).
"""
import argparse
import os
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", help="where the two .npy files go")
    args = p.parse_args()
    try:
        import numpy as np
        from sklearn.datasets import load_digits
    except ImportError as e:
        sys.exit(f"make_digits: needs numpy and scikit-learn ({e})")
    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    os.makedirs(args.out_dir, exist_ok=True)
    np.save(os.path.join(args.out_dir, "digits_images.npy"), images)
    np.save(os.path.join(args.out_dir, "digits_labels.npy"), labels)
    print(f"wrote {len(labels)} images to {args.out_dir}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the text `polygraphy inspect model ENGINE --show layers` prints for an engine whose
layer information (`trtexec --exportLayerInfo` JSON) is given, using Polygraphy's own
formatter (`str_from_graph_data`) and its engine reader's tensor conversion (Polygraphy 0.53,
`tools/inspect/subtool/model/extractors/_trt.py`: `_infos_from_inspector_key`), without
TensorRT or a GPU. The test fixture tests/fixtures/engine/*.polygraphy.txt comes from it.

    python scripts/polygraphy_layer_text.py layers.json > layers.txt
"""
import json
import sys
from collections import OrderedDict

from polygraphy.tools.inspect.subtool.model.extractors._trt import _TRT_DTYPE_MAP
from polygraphy.tools.inspect.subtool.model.graph_data import GraphData, NodeInfo, TensorInfo
from polygraphy.tools.inspect.subtool.model.text import str_from_graph_data


def infos(layer, key):
    out = []
    for elem in layer.get(key) or []:
        if "Format/Datatype" in elem:
            fmt = elem["Format/Datatype"]
        else:
            fmt = " ".join(elem[k] for k in ("Datatype", "Format") if elem.get(k))
        dtype = next((v for k, v in _TRT_DTYPE_MAP.items() if k in fmt.upper()), None)
        doc = f"Format: {fmt}" if fmt and "N/A" not in fmt else ""
        out.append(TensorInfo(name=elem["Name"], dtype=dtype, shape=elem["Dimensions"], docstring=doc or None))
    return out


def main():
    info = json.load(open(sys.argv[1]))
    nodes = [
        NodeInfo(
            node_id=f"p0_node_{i}",
            name=l.get("Name", "Unknown"),
            op_type=l.get("LayerType", "Unknown"),
            inputs=infos(l, "Inputs"),
            outputs=infos(l, "Outputs"),
            attrs=OrderedDict(),
            origin=l.get("Origin", "Unknown"),
            tactic=l.get("TacticValue", "Unknown"),
        )
        for i, l in enumerate(info["Layers"])
    ]
    gd = GraphData(
        title="Name: Unnamed Network 0 | Explicit Batch Engine",
        model_type="trt_engine",
        graph_inputs=[],
        graph_outputs=[],
        nodes=nodes,
        edges=[],
        device_memory_bytes=0,
        num_io_tensors=len(info.get("Bindings", [])),
        profiles=[],
        per_profile_nodes=[nodes],
        num_layers=len(nodes),
    )
    sys.stdout.write(str_from_graph_data(gd, show_layers=True))


if __name__ == "__main__":
    main()

"""The stage-graph YAML: the shipped file covers both graph shapes; errors name the offending key."""

from __future__ import annotations

import pytest

from omniduplex.pipeline.config import GraphConfigError, PipelineConfig, StageConfig, load_graph
from omniduplex.pipeline.topology import ORCHESTRATOR, QWEN3_OMNI, UNIFIED


def test_default_graph_configures_every_stage_and_edge_of_both_shapes():
    pcfg = load_graph()
    for topo in (QWEN3_OMNI, UNIFIED):
        for stage in topo.stages:
            assert stage in pcfg.stages
            for dst in topo.out_edges(stage):
                assert f"{stage}->{dst}" in pcfg.edges
        assert f"{ORCHESTRATOR}->{topo.first}" in pcfg.edges
        assert set(topo.edge_tensors) == {(topo.upstream(s), s) for s in topo.stages} | {
            (s, d) for s in topo.stages for d in topo.out_edges(s)
        }


def test_unlisted_stage_takes_defaults():
    assert PipelineConfig().stage("unified") == StageConfig()


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("stages:\n  thinker: {max_num_seqs: 0}\n", "stages.thinker.max_num_seqs"),
        ("stages:\n  vocoder: {}\n", "stages.vocoder"),
        ("stages:\n  unified: {dtype: int8}\n", "stages.unified.dtype"),
        ("edges:\n  a-b: {}\n", "edges"),
    ],
)
def test_errors_name_the_key(tmp_path, yaml_text, key):
    p = tmp_path / "g.yaml"
    p.write_text(yaml_text)
    with pytest.raises(GraphConfigError, match=key.replace(".", r"\.")):
        load_graph(p)

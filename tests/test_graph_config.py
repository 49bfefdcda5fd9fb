"""The stage-graph YAML: the shipped file covers every graph shape; errors name the offending key."""

from __future__ import annotations

import pytest

from omniduplex.pipeline.config import GraphConfigError, PipelineConfig, StageConfig, load_graph
from omniduplex.pipeline.topology import CASCADE, ORCHESTRATOR, QWEN3_OMNI, UNIFIED, with_side_asr


def test_default_graph_configures_every_stage_and_edge_of_every_shape():
    pcfg = load_graph()
    shapes = (QWEN3_OMNI, UNIFIED, CASCADE, with_side_asr(QWEN3_OMNI), with_side_asr(UNIFIED))
    for topo in shapes:
        for stage in topo.all_stages:
            assert stage in pcfg.stages
            for dst in topo.out_edges(stage):
                assert f"{stage}->{dst}" in pcfg.edges
        for s in topo.entry_stages:
            assert f"{ORCHESTRATOR}->{s}" in pcfg.edges
        assert set(topo.edge_tensors) == {(topo.upstream(s), s) for s in topo.all_stages} | {
            (s, d) for s in topo.all_stages for d in topo.out_edges(s)
        }
    assert with_side_asr(CASCADE) is CASCADE  # its ASR is in the chain already
    assert with_side_asr(QWEN3_OMNI).terminal_stages == {"code2wav", "asr"}


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

"""The one safe loader, at the library layer: optimizer, runtime from a path, bytes and a ModelProto,
and the CLI. Each external-data escape is refused before a byte of the target is read, naming the
tensor and the location; nothing the secret holds reaches an error, a report or an output."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import runtime
from optimizer import LoadLimits, ModelLoadError, UnsafeModelError, load_model, optimize
from service.cli import app
from tests import hostile_models as hostile

runner = CliRunner()


@pytest.fixture
def cases(tmp_path):
    return hostile.external_data_cases(tmp_path)


def _each(cases):
    assert len(cases) >= 9
    return cases


def test_optimizer_refuses_every_escape_naming_tensor_and_location(cases, caplog):
    caplog.set_level(logging.DEBUG)
    for case in _each(cases):
        with pytest.raises(UnsafeModelError) as error:
            optimize(case.model_path, level="all")
        text = str(error.value)
        assert "tensor 'stolen'" in text and case.expected in text, (case.name, text)
        assert not hostile.leaks_secret(text), case.name
    assert not hostile.leaks_secret(caplog.text)


@pytest.mark.parametrize("form", ["path", "bytes", "proto"])
def test_runtime_refuses_every_escape(cases, form):
    for case in _each(cases):
        source = {
            "path": case.model_path,
            "bytes": case.model_path.read_bytes(),
            "proto": onnx.load(case.model_path, load_external_data=False),
        }[form]
        options = runtime.SessionOptions(external_data_dir=str(case.model_path.parent))
        with pytest.raises(UnsafeModelError) as error:
            runtime.InferenceSession(source, options)
        assert case.expected in str(error.value), (case.name, form, str(error.value))
        assert not hostile.leaks_secret(str(error.value))


@pytest.mark.parametrize("form", ["bytes", "proto"])
def test_bytes_and_protos_with_external_data_need_a_directory(tmp_path, form):
    """Even a location that would be fine beside a file is refused when no directory was given."""
    (tmp_path / "weights.bin").write_bytes(hostile.SECRET)
    proto = hostile.model_reading("weights.bin")
    source = proto.SerializeToString() if form == "bytes" else proto
    with pytest.raises(UnsafeModelError, match="came without a directory"):
        runtime.InferenceSession(source)
    with pytest.raises(UnsafeModelError, match="tensor 'stolen'.*'weights.bin'"):
        load_model(source)


def test_external_data_inside_the_model_directory_loads_and_runs(tmp_path):
    values = np.array([0, 1], dtype=np.int64)
    (tmp_path / "weights.bin").write_bytes(values.tobytes())
    path = tmp_path / "model.onnx"
    path.write_bytes(hostile.model_reading("weights.bin").SerializeToString())
    session = runtime.InferenceSession(path, runtime.SessionOptions(graph_optimization_level="disabled"))
    copied, unsqueezed = session.run(None, {})
    np.testing.assert_array_equal(copied, values)
    assert unsqueezed.shape == (1, 1, 3)
    # The same model as bytes, given its directory the way onnxruntime's config entry gives it.
    options = runtime.SessionOptions(external_data_dir=str(tmp_path))
    copied, _ = runtime.InferenceSession(path.read_bytes(), options).run(None, {})
    np.testing.assert_array_equal(copied, values)


def test_cli_refuses_an_escape_with_one_error_line(cases):
    case = next(c for c in cases if c.name == "absolute")
    result = runner.invoke(app, ["optimize", str(case.model_path), "--json"])
    assert result.exit_code == 2
    assert "tensor 'stolen'" in result.output and "absolute" in result.output
    assert not hostile.leaks_secret(result.output)


def test_raw_data_of_the_wrong_size_is_refused_at_load():
    with pytest.raises(ModelLoadError, match=r"tensor 'w' declares shape \[4\] \(16 bytes\) but its raw_data holds 12"):
        load_model(hostile.raw_data_of_wrong_size())
    with pytest.raises(ModelLoadError, match="raw_data holds 12"):
        runtime.InferenceSession(hostile.raw_data_of_wrong_size())


def test_duplicate_graph_outputs_are_a_load_error_naming_the_output():
    with pytest.raises(ModelLoadError, match="graph output 'y' is listed twice"):
        optimize(hostile.duplicate_graph_outputs())


def test_node_count_and_tensor_size_limits():
    with pytest.raises(ModelLoadError, match="51 nodes is over the limit of 50"):
        load_model(hostile.many_nodes(51), limits=LoadLimits(max_nodes=50))
    load_model(hostile.many_nodes(50), limits=LoadLimits(max_nodes=50))
    with pytest.raises(ModelLoadError, match="declares 16 bytes .* over the limit of 8"):
        load_model(hostile.raw_data_of_wrong_size(), limits=LoadLimits(max_tensor_bytes=8))


@pytest.mark.parametrize(
    "build, node",
    [(hostile.unsqueeze_axes_out_of_range, "bad_unsqueeze"), (hostile.transpose_perm_is_string, "bad_transpose")],
)
def test_folding_an_invalid_node_leaves_it_and_reports_it(build, node):
    result = optimize(build(), level="all")
    assert node in {n.name for n in result.model.graph}
    misses = [m for m in result.report.near_misses if m.rule == "ConstantFolding"]
    assert [m.anchor for m in misses] == [node]
    assert "cannot be evaluated on its constant inputs" in misses[0].reason


@pytest.mark.parametrize("build, node_names", [
    (hostile.huge_range, {"huge_range"}),
    (hostile.lying_broadcast, {"broadcast_add", "broadcast_expand"}),
])
def test_folding_never_allocates_beyond_its_budget(build, node_names):
    """Predicted from the inputs before evaluating: these would need 16 GB and 37 GiB."""
    result = optimize(build(), level="all")
    assert node_names <= {n.name for n in result.model.graph}


def test_long_names_are_shortened_and_doc_strings_left_out_of_reports():
    report = optimize(hostile.long_names(1_000_000), level="all").report
    text = str(report.to_dict())
    assert len(text) < 20_000
    assert "d" * 1000 not in text
    assert all(len(m.anchor) < 300 for m in report.near_misses)


def test_near_miss_texts_quote_at_most_a_few_tensor_values(tmp_path):
    """An Unsqueeze whose axes are 1,000 bad values: the near miss shows four and a count."""
    data = onnx.helper.make_tensor("data", onnx.TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    axes = onnx.numpy_helper.from_array(np.arange(100, 1100, dtype=np.int64), "axes")
    node = onnx.helper.make_node("Unsqueeze", ["data", "axes"], ["u"], name="u")
    neg = onnx.helper.make_node("Neg", ["u"], ["y"])
    graph = onnx.helper.make_graph([node, neg], "g", [], [onnx.helper.make_tensor_value_info("y", 1, None)], [data, axes])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    report = optimize(model, level="basic").report
    reasons = " ".join(m.reason for m in report.near_misses)
    assert "[100, 101, 102, 103, … 1000 values]" in reasons
    assert "104" not in reasons


@pytest.mark.parametrize("engine", ["fusionwatch", "onnxruntime"])
def test_both_engines_refuse_before_opening_the_file(cases, engine):
    """onnxruntime resolves external data itself, so the service checks the file before handing it over."""
    from service.adapters.engines import EngineError, run_engine

    for case in _each(cases):
        with pytest.raises(EngineError) as error:
            run_engine(engine, case.model_path, "all", runs=1, warmup=0)
        assert "tensor 'stolen'" in str(error.value) and case.expected in str(error.value), case.name
        assert not hostile.leaks_secret(str(error.value))


def test_cycles_and_values_nothing_produces_are_load_errors_naming_the_node():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    cycle = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["b"], name="second")],
        "g", [x], [y],
    )
    with pytest.raises(ModelLoadError, match="has a cycle through node"):
        load_model(helper.make_model(cycle))
    dangling = helper.make_graph([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], "g", [x], [y])
    with pytest.raises(ModelLoadError, match="node #0 'adder' \\(Add\\) of the main graph reads 'ghost', which no graph input"):
        optimize(helper.make_model(dangling))


def test_a_rule_that_cannot_read_a_malformed_pattern_reports_it_as_a_near_miss():
    """A Transpose whose perm repeats an axis inside an attention-shaped graph must not take the optimizer down."""
    import onnx

    model = onnx.load("tests/models/bert_static_torchscript_opset14.onnx")
    transposes = [n for n in model.graph.node if n.op_type == "Transpose"]
    for attribute in transposes[0].attribute:
        if attribute.name == "perm":
            attribute.ints[:] = [0, 0, 0, 0]
    report = optimize(model, level="extended").report
    assert report.nodes_after > 0


def test_an_attribute_without_its_type_or_value_is_a_load_error_naming_node_and_attribute():
    """A flipped byte can clear an attribute's type (fuzzing found it on the BERT fixture): onnx-ir
    then reads no value, and a rule asking for the Constant's tensor crashed instead of refusing."""
    from onnx import TensorProto, helper

    def model(attribute_type, keep_tensor=True):
        constant = helper.make_node("Constant", [], ["c"], name="the_constant",
                                    value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0]))
        constant.attribute[0].type = attribute_type
        if not keep_tensor:
            constant.attribute[0].ClearField("t")
        add = helper.make_node("Add", ["x", "c"], ["y"], name="adder")
        graph = helper.make_graph([constant, add], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    untyped = model(onnx.AttributeProto.UNDEFINED)
    with pytest.raises(ModelLoadError, match=r"node #0 'the_constant' \(Constant\) of the main graph has attribute "
                                             r"'value' without a type"):
        optimize(untyped)
    with pytest.raises(ModelLoadError, match="attribute 'value' without a type"):
        runtime.InferenceSession(untyped.SerializeToString())
    with pytest.raises(ModelLoadError, match="has attribute 'value' of type TENSOR without its value"):
        load_model(model(onnx.AttributeProto.TENSOR, keep_tensor=False))
    assert runtime.InferenceSession(model(onnx.AttributeProto.TENSOR).SerializeToString()).run(
        None, {"x": np.array([1.0, 1.0], np.float32)})[0].tolist() == [2.0, 3.0]


def test_a_sparse_attribute_is_refused_by_name_without_quoting_its_values():
    """onnx-ir cannot read sparse tensors yet; its error quoted the whole attribute, values included."""
    from onnx import TensorProto, helper

    values = helper.make_tensor("v", TensorProto.FLOAT, [2], [1.25, 2.5])
    sparse = helper.make_sparse_tensor(values, helper.make_tensor("i", TensorProto.INT64, [2], [0, 3]), [4])
    constant = helper.make_node("Constant", [], ["c"], name="dense_later", sparse_value=sparse)
    graph = helper.make_graph([constant, helper.make_node("Add", ["x", "c"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelLoadError) as refused:
        load_model(proto)
    assert str(refused.value) == ("<ModelProto>: node #0 'dense_later' (Constant) of the main graph has attribute "
                                  "'sparse_value', a sparse tensor, which fusionwatch cannot read yet: write it dense "
                                  "(a Constant's 'value')")


def _function_model(depth: int, recursive: bool = False):
    """f0 calls f1 twice, f1 calls f2 twice, ... f(depth) is one Relu: 2**depth Relus once inlined."""
    from onnx import TensorProto, helper

    functions = []
    for level in range(depth + 1):
        if level == depth and not recursive:
            nodes = [helper.make_node("Relu", ["a"], ["b"])]
        else:
            callee = "f0" if level == depth else f"f{level + 1}"
            nodes = [helper.make_node(callee, ["a"], ["t"], domain="local"),
                     helper.make_node(callee, ["t"], ["b"], domain="local")]
        functions.append(helper.make_function("local", f"f{level}", ["a"], ["b"], nodes,
                                              [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))
    graph = helper.make_graph([helper.make_node("f0", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, functions=functions,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])


def test_local_functions_are_inlined_and_their_inlined_size_is_bounded():
    """A model's local functions run as onnxruntime runs them, inlined (onnxscript-based exporters
    write them); calls nested two by two would inline to 2**depth nodes, and a function calling
    itself never ends: both are refused before any inlining."""
    model = load_model(_function_model(3))
    assert not model.functions and [n.op_type for n in model.graph] == ["Relu"] * 8
    x = np.array([-1.0, 2.0], np.float32)
    assert runtime.InferenceSession(_function_model(3).SerializeToString()).run(None, {"x": x})[0].tolist() == [0.0, 2.0]
    with pytest.raises(ModelLoadError, match=r"65536 nodes once its local functions are inlined, over the limit of 50000"):
        load_model(_function_model(20))
    with pytest.raises(ModelLoadError, match="local function local.f0 calls itself"):
        optimize(_function_model(2, recursive=True))
    chain = _function_model(3000)  # refused for its depth before it could exhaust Python's stack
    with pytest.raises(ModelLoadError, match="local functions call each other more than 64 deep"):
        load_model(chain)


@pytest.fixture(scope="module")
def model_of_200000_nodes(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "many.onnx"
    path.write_bytes(hostile.many_nodes(200_000).SerializeToString())
    return path


def test_the_cli_and_the_runtime_refuse_a_200000_node_model_naming_the_shared_limit(model_of_200000_nodes):
    """The upload's node limit is the loader's default, so `fusionwatch optimize` and a runtime session
    refuse what an upload would (they took 57 s and 42 s before)."""
    from service.core.config import Settings

    assert Settings().max_nodes == LoadLimits().max_nodes == 50_000
    expected = "200000 nodes is over the limit of 50000 (FUSIONWATCH_MAX_NODES)"
    result = runner.invoke(app, ["optimize", str(model_of_200000_nodes), "--json"])
    assert result.exit_code == 2 and expected in result.output, result.output
    with pytest.raises(ModelLoadError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        runtime.InferenceSession(model_of_200000_nodes)
    with pytest.raises(ModelLoadError, match="200000 nodes is over the limit"):
        runtime.InferenceSession(onnx.load(model_of_200000_nodes))
    ir_model = load_model(model_of_200000_nodes, limits=LoadLimits(max_nodes=200_000))
    with pytest.raises(ModelLoadError, match="<ir.Model>: 200000 nodes is over the limit of 50000"):
        runtime.InferenceSession(ir_model)


def test_an_external_data_entry_listing_a_key_twice_is_refused_naming_it(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.array([0, 1], np.int64).tobytes())
    model = hostile.model_reading("weights.bin")
    repeated = model.graph.initializer[0].external_data.add()
    repeated.key, repeated.value = "location", "other.bin"
    (tmp_path / "model.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match="tensor 'stolen' lists the external-data key 'location' 2 times"):
        optimize(tmp_path / "model.onnx")


def test_a_sparse_initializer_is_refused_by_name():
    """onnx-ir drops sparse initializers with a warning; the model then failed as reading an undefined value."""
    from onnx import TensorProto, helper

    values = helper.make_tensor("offsets", TensorProto.FLOAT, [2], [1.25, 2.5])
    sparse = helper.make_sparse_tensor(values, helper.make_tensor("i", TensorProto.INT64, [2], [0, 3]), [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "offsets"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], sparse_initializer=[sparse])
    with pytest.raises(ModelLoadError, match=r"^<ModelProto>: the main graph has sparse initializer\(s\) \['offsets'\], "
                                             r"which fusionwatch cannot read yet: write them dense$"):
        load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

//! Bad input is a typed error naming what was wrong, never a panic.

use fusegraph::{
    Backend, CompileOptions, DType, Device, DeviceOptions, GraphBuilder, HostTensor, IrError, RuntimeError,
};

#[test]
fn matmul_inner_dimension_mismatch_names_op_and_shapes() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]).unwrap();
    let w = b.input("w", DType::F32, [4, 5]).unwrap();
    let e = x.matmul(&w).unwrap_err();
    assert_eq!(e.to_string(), "matmul: lhs f32[2,3] and rhs f32[4,5]: inner dimensions 3 and 4 differ");
}

#[test]
fn builder_rejects_bad_shapes_and_dtypes() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]).unwrap();
    let y = b.input("y", DType::F32, [4]).unwrap();
    let i = b.input("i", DType::I32, [2, 3]).unwrap();
    let err = |r: Result<fusegraph::Tensor, IrError>| r.unwrap_err().to_string();
    assert!(err(x.add(&y)).starts_with("add: lhs f32[2,3] and rhs f32[4]: shapes do not broadcast"));
    assert!(err(x.add(&i)).contains("dtypes differ"));
    assert!(err(i.exp()).starts_with("exp: operand i32[2,3]: dtype i32 is not supported"));
    assert!(err(x.reshape([7])).contains("cannot reshape to [7]"));
    assert!(err(x.transpose(&[0, 0])).contains("not a permutation"));
    assert!(err(x.slice(&[0, 0], &[3, 3], &[1, 1])).contains("axis 0"));
    assert!(err(x.sum(&[2], false)).contains("axes [2]"));
    assert!(err(x.gather(&y, 0)).contains("must be i32 or u32"));
    assert!(err(x.conv2d(&x, [1, 1], [0, 0], [1, 1], 1)).starts_with("conv2d:"));
    assert!(err(b.constant(DType::F32, [3], &[1.0])).contains("1 values given for f32[3]"));
    assert!(err(b.full(DType::I32, [3], 0.5)).contains("not representable in i32"));
    let other = GraphBuilder::new().input("z", DType::F32, [2, 3]).unwrap();
    assert_eq!(err(x.add(&other)), "add: operands belong to different graphs");
}

fn add_graph() -> (fusegraph::Graph, Vec<fusegraph::NodeId>) {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]).unwrap();
    let w = b.parameter("w", DType::F32, [3]).unwrap();
    let y = x.add(&w).unwrap();
    (b.graph(), vec![y.id()])
}

#[test]
fn run_time_feed_errors_are_typed() {
    let (g, outs) = add_graph();
    let device = Device::shared().unwrap();
    let mut exe = device.compile(&g, &outs, &CompileOptions::default()).unwrap();
    let good = HostTensor::new([2, 3], vec![1.0f32; 6]).unwrap();
    let bad_shape = HostTensor::new([3, 2], vec![1.0f32; 6]).unwrap();
    let bad_dtype = HostTensor::new([2, 3], vec![1i32; 6]).unwrap();

    // Parameter not set yet.
    assert!(matches!(exe.run(&[("x", &good)]), Err(RuntimeError::MissingParameter { .. })));
    let e = exe.set_parameter("w", &good).unwrap_err();
    assert_eq!(e.to_string(), "parameter `w`: expected f32[3], got f32[2,3]");
    assert!(matches!(exe.set_parameter("nope", &good), Err(RuntimeError::UnknownParameter { .. })));
    exe.set_parameter("w", &HostTensor::new([3], vec![1.0f32, 2.0, 3.0]).unwrap()).unwrap();

    assert!(matches!(exe.run::<&str>(&[]), Err(RuntimeError::MissingFeed { .. })));
    let e = exe.run(&[("x", &bad_shape)]).unwrap_err();
    assert_eq!(e.to_string(), "feed `x`: expected f32[2,3], got f32[3,2]");
    assert!(matches!(exe.run(&[("x", &bad_dtype)]), Err(RuntimeError::WrongType { .. })));
    assert!(matches!(exe.run(&[("x", &good), ("y", &good)]), Err(RuntimeError::UnknownFeed { .. })));

    // After the errors, a good run still works and parameters persisted.
    let out = exe.run(&[("x", &good)]).unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &[2.0, 3.0, 4.0, 2.0, 3.0, 4.0]);
    let out = exe.run(&[("x", &good)]).unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &[2.0, 3.0, 4.0, 2.0, 3.0, 4.0]);
}

/// An input the outputs do not need (declared, but pruned from the executable) may still be
/// fed — checked against its declaration and ignored — as `Executable::inputs` documents;
/// only names the graph never declared are unknown (the outputs of a random graph of
/// tests/fuzz_device.rs need not reach every input).
#[test]
fn feeds_of_declared_inputs_the_outputs_do_not_need_are_accepted() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2]).unwrap();
    let _unused = b.input("unused", DType::F32, [3]).unwrap();
    let y = x.neg().unwrap();
    let exe = fusegraph::compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap();
    assert_eq!(exe.inputs().len(), 2);
    let xv = HostTensor::new([2], vec![1.0f32, -2.0]).unwrap();
    let uv = HostTensor::new([3], vec![5.0f32; 3]).unwrap();
    let out = exe.run(&[("x", &xv), ("unused", &uv)]).unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &[-1.0, 2.0]);
    // Not needed, so not required either; a wrong type is still an error; an undeclared name too.
    assert!(exe.run(&[("x", &xv)]).is_ok());
    let e = exe.run(&[("x", &xv), ("unused", &xv)]).unwrap_err();
    assert_eq!(e.to_string(), "feed `unused`: expected f32[3], got f32[2]");
    assert!(matches!(exe.run(&[("x", &xv), ("nope", &xv)]), Err(RuntimeError::UnknownFeed { .. })));
}

#[test]
fn unknown_backend_is_typed() {
    assert!(matches!("cuda".parse::<Backend>(), Err(RuntimeError::UnknownBackend { .. })));
    assert_eq!("Vulkan".parse::<Backend>().unwrap(), Backend::Vulkan);
    // FUSEGRAPH_BACKEND is read when no backend is forced in the options; this test forces
    // one, so it does not depend on the environment.
    let d = Device::new(&DeviceOptions { backend: Some(Backend::Gl), ..Default::default() });
    if let Ok(d) = d {
        assert_eq!(d.info().backend, fusegraph::crates::runtime::WgpuBackend::Gl);
    }
}

/// The cooperative-matrix emulation (a testing option) refuses a pretend subgroup size that
/// does not split the kernel's 128 invocations, and packed f16, by name.
#[test]
fn cooperative_matrix_emulation_options_are_checked() {
    for size in [0, 48, 256] {
        let opts = DeviceOptions { cooperative_matrix_emulation: Some(size), ..Default::default() };
        match Device::new(&opts) {
            Err(RuntimeError::InvalidOption { option, detail }) => {
                assert_eq!(option, "cooperative_matrix_emulation");
                assert!(detail.contains(&size.to_string()), "{detail}");
            }
            other => panic!("size {size}: {other:?}"),
        }
    }
    let packed =
        DeviceOptions { cooperative_matrix_emulation: Some(32), f16_native: Some(false), ..Default::default() };
    let err = Device::new(&packed).unwrap_err();
    assert!(err.to_string().contains("needs native f16"), "{err}");
}

#[test]
fn host_tensor_rejects_wrong_length() {
    let e = HostTensor::new([2, 2], vec![1.0f32; 3]).unwrap_err();
    assert!(e.to_string().contains("3 values given for shape [2,2]"));
}

/// A tensor larger than one storage binding (lavapipe's 128 MiB: GPT-2's f32 token
/// embedding is 154 MB) is a typed error naming the parameter, before anything is allocated.
#[test]
fn a_parameter_past_the_binding_limit_is_named() {
    let device = fusegraph::Device::shared().unwrap();
    let max = device.limits().max_storage_buffer_binding_size;
    let n = (max / 4 + 1) as usize;
    let b = GraphBuilder::new();
    let w = b.parameter("wte.weight", DType::F32, [n]).unwrap();
    let y = w.mul_scalar(2.0).unwrap();
    let before = device.memory().allocated;
    match device.compile(&b.graph(), &[y.id()], &CompileOptions::default()) {
        Err(RuntimeError::TooLarge { what, limit, .. }) => {
            assert!(what.contains("parameter `wte.weight`") && what.contains("storage binding"), "{what}");
            assert_eq!(limit, max);
        }
        other => panic!("expected TooLarge, got {:?}", other.map(|_| ())),
    }
    assert_eq!(device.memory().allocated, before);
}

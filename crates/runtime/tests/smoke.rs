use fusegraph_ir::{DType, GraphBuilder, HostTensor};
use fusegraph_runtime::{CompileOptions, Device};

#[test]
fn add_and_matmul() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]).unwrap();
    let w = b.input("w", DType::F32, [3, 2]).unwrap();
    let y = x.matmul(&w).unwrap().relu().unwrap();
    let dev = Device::shared().unwrap();
    eprintln!("DEVICE {}", dev.describe());
    let exe = dev.compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap();
    let xv = HostTensor::new([2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let wv = HostTensor::new([3, 2], vec![1.0f32, -1.0, 0.5, -2.0, 1.0, 0.0]).unwrap();
    let out = exe.run(&[("x", &xv), ("w", &wv)]).unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &[5.0, 0.0, 12.5, 0.0]);
}

//! `fusegraph run MODEL.onnx --input NAME=FILE.npy … [--output DIR]`: an ONNX model
//! imported, fused and run on the device, each output written as NumPy's `.npy`.

use clap::Args;
use fusegraph::onnx::OnnxModel;
use fusegraph::{CompileOptions, DType, Device, GraphBuilder, HostTensor, ParamStore};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Runs an ONNX model on the device: inputs from `.npy` files, outputs written as `.npy`,
/// and a summary (ops recorded, kernels after fusion, planned bytes, time per run).
#[derive(Args)]
pub struct RunArgs {
    /// The model (`.onnx`; external data files beside it).
    model: PathBuf,
    /// A graph input: `NAME=FILE.npy`, one per input (its shape gives named dimensions
    /// their sizes).
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Write each output as `DIR/NAME.npy` (int64 outputs as int32, what fusegraph computes).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Timed runs after the first (the summary gives their median).
    #[arg(long, default_value_t = 5)]
    runs: usize,
}

/// An `.npy` file as a host tensor: C order; float32/float64 as f32, int32/int64 as i32
/// (int64 values checked), uint32, bool.
pub fn read_npy(path: &Path) -> Result<HostTensor, String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let bytes = std::fs::read(path).map_err(|e| err(&e))?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| err(&e))?;
    if npy.order() != npyz::Order::C {
        return Err(err(&"Fortran order (write it in C order)"));
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let npyz::DType::Plain(ts) = npy.dtype() else { return Err(err(&"a structured array")) };
    let ty = (ts.type_char(), ts.size_field());
    use npyz::TypeChar::{Bool, Float, Int, Uint};
    let t = match ty {
        (Float, 4) => HostTensor::new(shape, npy.into_vec::<f32>().map_err(|e| err(&e))?),
        (Float, 8) => {
            let v: Vec<f64> = npy.into_vec().map_err(|e| err(&e))?;
            HostTensor::from_f64(DType::F32, shape, &v)
        }
        (Int, 4) => HostTensor::new(shape, npy.into_vec::<i32>().map_err(|e| err(&e))?),
        (Int, 8) => {
            let v: Vec<i64> = npy.into_vec().map_err(|e| err(&e))?;
            let v: Vec<i32> = v
                .into_iter()
                .map(|x| i32::try_from(x).map_err(|_| err(&format!("int64 value {x} does not fit i32"))))
                .collect::<Result<_, _>>()?;
            HostTensor::new(shape, v)
        }
        (Uint, 4) => HostTensor::new(shape, npy.into_vec::<u32>().map_err(|e| err(&e))?),
        (Bool, _) => HostTensor::new(shape, npy.into_vec::<bool>().map_err(|e| err(&e))?),
        _ => return Err(err(&format!("dtype {ts} (float32/64, int32/64, uint32 and bool are read)"))),
    };
    t.map_err(|e| err(&e))
}

/// Writes `t` as an `.npy` file (f16 and bf16 as float32).
pub fn write_npy(path: &Path, t: &HostTensor) -> Result<(), String> {
    use npyz::WriterBuilder;
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let shape: Vec<u64> = t.shape().dims().iter().map(|&d| d as u64).collect();
    let file = std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| err(&e))?);
    macro_rules! write {
        ($ty:ty, $values:expr) => {{
            let mut w = npyz::WriteOptions::<$ty>::new()
                .default_dtype()
                .shape(&shape)
                .writer(file)
                .begin_nd()
                .map_err(|e| err(&e))?;
            w.extend($values).map_err(|e| err(&e))?;
            w.finish().map_err(|e| err(&e))
        }};
    }
    match t.dtype() {
        DType::I32 => write!(i32, t.as_slice::<i32>().expect("i32").iter().copied()),
        DType::U32 => write!(u32, t.as_slice::<u32>().expect("u32").iter().copied()),
        DType::Bool => write!(bool, t.as_slice::<bool>().expect("bool").iter().copied()),
        _ => write!(f32, t.to_f64().into_iter().map(|v| v as f32)),
    }
}

/// A file name for an output: its name with path separators and colons replaced.
fn file_name(name: &str) -> String {
    name.chars().map(|c| if matches!(c, '/' | '\\' | ':') { '_' } else { c }).collect()
}

pub fn run(a: &RunArgs) -> Result<(), String> {
    let model = OnnxModel::open(&a.model).map_err(|e| e.to_string())?;
    let declared = model.inputs().map_err(|e| e.to_string())?;
    let mut feeds: BTreeMap<String, HostTensor> = BTreeMap::new();
    for spec in &a.inputs {
        let (name, file) = spec.split_once('=').ok_or_else(|| format!("--input `{spec}`: expected NAME=FILE.npy"))?;
        let Some(info) = declared.iter().find(|i| i.name == name) else {
            let names: Vec<&str> = declared.iter().map(|i| i.name.as_str()).collect();
            return Err(format!("--input `{name}`: the model's inputs are {}", names.join(", ")));
        };
        let t = read_npy(Path::new(file))?;
        let t = if t.dtype() == info.dtype {
            t
        } else if t.dtype().is_float() == info.dtype.is_float() {
            HostTensor::from_f64(info.dtype, t.shape().clone(), &t.to_f64()).map_err(|e| e.to_string())?
        } else {
            return Err(format!("--input `{name}`: {} given, the model takes {}", t.dtype(), info.dtype));
        };
        feeds.insert(name.to_string(), t);
    }
    if let Some(missing) = declared.iter().find(|i| !feeds.contains_key(&i.name)) {
        return Err(format!("no --input for the model's input `{}`", missing.name));
    }
    let b = GraphBuilder::new();
    let imported = model.import_for(&b, &feeds).map_err(|e| e.to_string())?;
    let graph = b.graph();
    let ids: Vec<_> = imported.outputs.iter().map(|(_, t)| t.id()).collect();
    let ops =
        graph.reachable(&ids).map_err(|e| e.to_string())?.iter().filter(|&&n| !graph.node(n).op.is_leaf()).count();
    let device = Device::shared().map_err(|e| e.to_string())?;
    let store = ParamStore::new(&device);
    store.insert_all(imported.params.iter()).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let exe = store.compile(&graph, &ids, &CompileOptions::default()).map_err(|e| e.to_string())?;
    let compiled = start.elapsed().as_secs_f64();
    let run: Vec<(&str, &HostTensor)> = feeds.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let outs = exe.run(&run).map_err(|e| e.to_string())?;
    let mut times: Vec<f64> = (0..a.runs)
        .map(|_| {
            let t = Instant::now();
            exe.run(&run).map(|_| t.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    times.sort_by(f64::total_cmp);
    if let Some(dir) = &a.output {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for ((name, _), t) in imported.outputs.iter().zip(&outs) {
            write_npy(&dir.join(format!("{}.npy", file_name(name))), t)?;
        }
    }
    for ((name, _), t) in imported.outputs.iter().zip(&outs) {
        println!("{name}: {}", t.ty());
    }
    let s = exe.stats();
    let bytes =
        |b: u64| if b >= 1_000_000 { format!("{:.2} MB", b as f64 / 1e6) } else { format!("{:.1} kB", b as f64 / 1e3) };
    let time = times
        .get(times.len() / 2)
        .map_or("no timed runs".into(), |m| format!("{m:.3} ms per run (median of {}, with transfers)", times.len()));
    eprintln!(
        "{}: {ops} ops → {} fused kernels; {} planned for values, {} of parameters; compiled in {compiled:.2} s; {time}; on {}",
        a.model.display(),
        s.kernels.len(),
        bytes(s.arena_bytes),
        bytes(s.persistent_bytes),
        device.describe()
    );
    Ok(())
}

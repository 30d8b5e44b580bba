//! Loads a Hugging Face Qwen2 directory with kevin, saves it again (f32 or bf16), reloads the
//! saved copy and writes kevin's logits on the source's `expected.safetensors` ids next to it,
//! for `python tests/qwen2_parity.py --check-kevin OUT` to compare with transformers.
//!
//! `cargo run -p kevin-policy --example qwen2_resave -- SRC OUT [f32|bf16]` (NdArray, CPU).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};
use kevin_policy::checkpoint::{self, SaveDtype};
use kevin_policy::CausalLm;
use safetensors::{Dtype, SafeTensors};

type B = NdArray<f32>;

fn run(src: PathBuf, out: PathBuf, dtype: SaveDtype) -> Result<(), String> {
    let device = Default::default();
    let (model, cfg) = checkpoint::load::<B>(&src, &device).map_err(|e| e.to_string())?;
    checkpoint::save(&model, &cfg, &out, dtype).map_err(|e| e.to_string())?;
    let (saved, _) = checkpoint::load::<B>(&out, &device).map_err(|e| e.to_string())?;

    let path = src.join("expected.safetensors");
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let ids = st
        .tensor("input_ids")
        .map_err(|e| format!("{}: input_ids: {e}", path.display()))?;
    let shape = ids.shape().to_vec();
    let ids_i64: Vec<i64> = ids
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids_i64, shape.clone()), &device);
    let logits = saved.forward(tokens);
    let logits_shape = logits.dims().to_vec();
    let logits: Vec<f32> = logits
        .into_data()
        .convert::<f32>()
        .into_vec()
        .map_err(|e| format!("{e:?}"))?;
    let logit_bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = vec![
        (
            "input_ids",
            safetensors::tensor::TensorView::new(Dtype::I64, shape, ids.data()).unwrap(),
        ),
        (
            "logits",
            safetensors::tensor::TensorView::new(Dtype::F32, logits_shape, &logit_bytes).unwrap(),
        ),
    ];
    let target = out.join("expected.safetensors");
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &target)
        .map_err(|e| format!("{}: {e}", target.display()))?;
    println!("{}: saved as {dtype:?} with kevin's logits", out.display());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dtype = match args.get(2).map(String::as_str) {
        None | Some("f32") => SaveDtype::F32,
        Some("bf16") => SaveDtype::Bf16,
        Some(other) => {
            eprintln!("dtype must be f32 or bf16, found {other:?}");
            return ExitCode::from(2);
        }
    };
    let (Some(src), Some(out)) = (args.first(), args.get(1)) else {
        eprintln!("usage: qwen2_resave SRC OUT [f32|bf16]");
        return ExitCode::from(2);
    };
    match run(src.into(), out.into(), dtype) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qwen2_resave: {e}");
            ExitCode::FAILURE
        }
    }
}

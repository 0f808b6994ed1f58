"""The Base models' speaker encoder: 24 kHz reference audio → x-vector (ECAPA-TDNN over a 128-bin log-mel).

The x-vector is the talker-width speaker row of a Base prompt (prompt.VoiceClone). Parameter names follow
`speaker_encoder.*` in the Base checkpoints. The mel front end (n_fft 1024, hop 256, Hann 1024, 128 Slaney
mel bins 0-12 kHz, log with floor 1e-5) is fixed in the reference's `extract_speaker_embedding`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE, N_FFT, HOP, N_MELS, F_MAX = 24000, 1024, 256, 128, 12000.0


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above (librosa's default, htk=False)."""
    f = np.asarray(f, dtype=np.float64)
    lin = f / (200.0 / 3)
    log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log, lin)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    lin = m * (200.0 / 3)
    log = 1000.0 * np.exp((math.log(6.4) / 27.0) * (m - 15.0))
    return np.where(m >= 15.0, log, lin)


def mel_filterbank(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS, fmin: float = 0.0,
                   fmax: float = F_MAX) -> np.ndarray:
    """Triangular Slaney-normalised mel filters [n_mels, n_fft//2 + 1] (what librosa.filters.mel gives)."""
    fft_freqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(np.array(fmin)), _hz_to_mel(np.array(fmax)), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fft_freqs)
    lower = -ramps[:n_mels] / fdiff[:n_mels, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return (weights * (2.0 / (mel_f[2:] - mel_f[:n_mels]))[:, None]).astype(np.float32)


def log_mel(wav: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """wav [B, samples] at 24 kHz → log-mel [B, frames, 128] (reflect-padded, uncentred STFT)."""
    pad = (N_FFT - HOP) // 2
    x = F.pad(wav[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(x, N_FFT, hop_length=HOP, win_length=N_FFT, window=torch.hann_window(N_FFT, device=x.device),
                      center=False, normalized=False, onesided=True, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis @ mag, min=1e-5)).transpose(1, 2)


class TDNNBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(
            TDNNBlock(channels // scale, channels // scale, kernel, dilation) for _ in range(scale - 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out, prev = [parts[0]], None
        for i, part in enumerate(parts[1:]):
            prev = self.blocks[i](part if prev is None else part + prev)
            out.append(prev)
        return torch.cat(out, dim=1)


class SEBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(channels, se_channels, 1)
        self.conv2 = nn.Conv1d(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * s


class SERes2NetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(c_in, c_out, 1, 1)
        self.res2net_block = Res2NetBlock(c_out, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(c_out, c_out, 1, 1)
        self.se_block = SEBlock(c_out, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatsPool(nn.Module):
    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    @staticmethod
    def _stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (w * x).sum(2)
        std = torch.sqrt((w * (x - mean[..., None]).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        mean, std = self._stats(x, torch.full_like(x[:, :1], 1.0 / t))
        context = torch.cat([x, mean[..., None].expand(-1, -1, t), std[..., None].expand(-1, -1, t)], dim=1)
        attn = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, attn)
        return torch.cat([mean, std], dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN; config fields are those of `speaker_encoder_config` in config.json."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        ch = cfg.get("enc_channels", [512, 512, 512, 512, 1536])
        ks = cfg.get("enc_kernel_sizes", [5, 3, 3, 3, 1])
        ds = cfg.get("enc_dilations", [1, 2, 3, 4, 1])
        scale, se = cfg.get("enc_res2net_scale", 8), cfg.get("enc_se_channels", 128)
        self.blocks = nn.ModuleList([TDNNBlock(cfg.get("mel_dim", N_MELS), ch[0], ks[0], ds[0])])
        self.blocks.extend(SERes2NetBlock(ch[i - 1], ch[i], scale, se, ks[i], ds[i]) for i in range(1, len(ch) - 1))
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], ds[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.get("enc_attention_channels", 128))
        self.fc = nn.Conv1d(ch[-1] * 2, cfg.get("enc_dim", 1024), 1)
        self.register_buffer("mel_basis", torch.from_numpy(mel_filterbank()), persistent=False)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """log-mel [B, frames, 128] → x-vectors [B, enc_dim]."""
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x))[..., 0]

    @torch.no_grad()
    def embed(self, wav: np.ndarray | torch.Tensor) -> torch.Tensor:
        """A mono 24 kHz waveform [samples] → its x-vector [enc_dim]."""
        w = torch.as_tensor(np.asarray(wav, dtype=np.float32), device=self.mel_basis.device)
        return self(log_mel(w[None], self.mel_basis).to(self.fc.weight.dtype))[0]

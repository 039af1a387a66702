"""Seed 003's benchmark ("PyTorch data prefetching: overlap CPU preprocessing with GPU
compute"), verbatim but for one line: DataLoader comes from stoker instead of torch.

    python examples/seed003_prefetch.py
"""
import torch
from torch.utils.data import Dataset
from stoker import DataLoader  # the one line changed from seed 003
import time
import os

# 模拟一个数据加载很慢的Dataset
class HeavyDataset(Dataset):
    def __init__(self, size=1000, sleep_time=0.005):
        # 模拟 1000 个 3x224x224 的数据块
        self.data = [torch.rand(3, 224, 224) for _ in range(size)]
        # 模拟 CPU 预处理耗时 (例如:图像解码和复杂增强)
        self.sleep_time = sleep_time

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        # 模拟 CPU 密集型操作
        time.sleep(self.sleep_time)
        return self.data[idx], torch.tensor(idx % 10)

# 训练模拟函数
def train_epoch(dataloader, device, name, batch_size):
    # 模拟一个简单的线性模型进行计算
    model = torch.nn.Linear(224*224*3, 10).to(device)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters())

    start_time = time.time()
    print(f"\n--- Starting {name} (Batch Size: {batch_size}) ---")

    for i, (inputs, labels) in enumerate(dataloader):
        # 1. 数据转移到 GPU
        # 注意:使用 non_blocking=True 确保数据传输异步进行
        inputs = inputs.view(inputs.size(0), -1).to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)

        # 2. 模拟 GPU 计算
        if i % 5 == 0:
             # 模拟一个相对较长的计算时间,以确保数据预取有机会发挥作用
             time.sleep(0.01) 

        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()

    end_time = time.time()
    duration = end_time - start_time
    print(f"Time taken for {name}: {duration:.2f} seconds.")
    print(f"Avg batch/sec: {len(dataloader) / duration:.2f}")
    return duration

# --- 运行比较 ---

if __name__ == '__main__':
    DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"Running on device: {DEVICE}")

    # 获取可用的 CPU 核心数,用于设置 num_workers
    MAX_WORKERS = os.cpu_count() or 4
    BATCH_SIZE = 64
    DATASET = HeavyDataset(size=1024, sleep_time=0.005) # 0.005s 模拟加载时间

    # 场景 A: 无优化 (同步加载)
    dataloader_slow = DataLoader(
        DATASET, 
        batch_size=BATCH_SIZE, 
        shuffle=True, 
        num_workers=0, 
        pin_memory=False
    )
    time_slow = train_epoch(dataloader_slow, DEVICE, "Scenario A: Synchronous (num_workers=0)", BATCH_SIZE)

    # 场景 B: 完整优化 (异步加载 + 锁定内存)
    # 推荐 num_workers 设置为 CPU 核心数 - 1 或 2,或通过实验确定最佳值
    dataloader_fast = DataLoader(
        DATASET, 
        batch_size=BATCH_SIZE, 
        shuffle=True, 
        num_workers=min(8, MAX_WORKERS), 
        pin_memory=True
    )
    time_fast = train_epoch(dataloader_fast, DEVICE, f"Scenario B: Optimized (num_workers={min(8, MAX_WORKERS)}, pin_memory=True)", BATCH_SIZE)

    print(f"\nOptimization Speedup: {time_slow / time_fast:.2f}x")
